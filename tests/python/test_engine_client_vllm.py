"""hf3fs-meta driven through vLLM's own metadata client.

``Hf3fsGlobalMetadataClient`` is vLLM 0.33.0's class, read out of the vllm
wheel at test time (engine_wheels.py; nothing of it is in this repository).
Around it, ``Connector`` plays the rest of vLLM's HF3FS connector, written
here from the flow docs/api.md describes: the scheduler's
``batch_key_exists`` (only the leading run counts), and per worker rank the
save task (allocate, write the pages, confirm; on a failed write release
every page of the task) and the load task (``get_key_locations``, read).
Pages live in a simulated 3FS rank file (page -> bytes); every read checks
that the page holds the key it was read for, so a page given to two keys
shows up as a wrong read.

The server runs with --data-dir: the restart tests SIGKILL it and start it
again on the same data, and the clients carry on without a new initialize,
as vLLM's workers do. The retry tests put the gateway (gateway.py) between
client and server, to make the server unavailable for a counted number of
attempts; the client's own urllib3 retry loop (3 retries on 500/502/503/504)
is what has to get through.

The connector builds its clients with no argument (localhost:18000); here
each gets the test server's address, the only difference.
"""

from __future__ import annotations

import hashlib
import threading

import pytest

WORLD = 2  # tensor-parallel worker ranks
NUM_PAGES = 64
ATTEMPTS = 4  # Retry(total=3): the first try and three retries
JOIN_DEADLINE_S = 60.0


def block_hashes(n: int, seed: str) -> list[str]:
    """Chained block keys as vLLM forms them: md5 of the previous key and the
    block's tokens, 32 lowercase hex digits."""
    out, prev = [], seed
    for i in range(n):
        prev = hashlib.md5(f"{prev}_{[i, i + 1, i + 2]}".encode()).hexdigest()
        out.append(prev)
    return out


def page_bytes(key: str, rank: int) -> bytes:
    return f"{key}@rank{rank}".encode()


class WriteFailed(Exception):
    """A simulated I/O error while writing a page."""


class Connector:
    """The connector's flows over the engine's client class, one client per
    process as vLLM has them: the scheduler and one per worker rank."""

    def __init__(self, client_cls, base_url: str, world: int = WORLD, num_pages: int = NUM_PAGES):
        self.scheduler = client_cls(base_url)
        self.scheduler.initialize(0, role="scheduler")
        self.workers = [client_cls(base_url) for _ in range(world)]
        for rank, worker in enumerate(self.workers):
            worker.initialize(rank, num_pages)
        # The simulated 3FS rank files: page -> bytes. They survive a server
        # restart, as the files on 3FS do.
        self.files: list[dict[int, bytes]] = [{} for _ in range(world)]

    def hits(self, keys: list[str]) -> int:
        """The scheduler's lookup: the length of the leading run of hits."""
        flags = self.scheduler.batch_key_exists(keys)
        assert len(flags) == len(keys), flags
        n = 0
        while n < len(flags) and flags[n]:
            n += 1
        return n

    def save(self, rank: int, keys: list[str], fail_write_at: int | None = None) -> dict[str, int] | None:
        """One save task on `rank`. Returns key -> page once confirmed; None
        when the allocate gave a -1 (the task fails, nothing released).
        `fail_write_at`: the write of that page fails after the pages before
        it were written (and that one half written), and every page of the
        task is released, reused ones included."""
        worker = self.workers[rank]
        results = worker.allocate_pages_for_keys(rank, [(k, "") for k in keys])
        assert [k for k, _ in results] == list(dict.fromkeys(keys)), results
        if any(page == -1 for _, page in results):
            return None
        try:
            for i, (key, page) in enumerate(results):
                if i == fail_write_at:
                    self.files[rank][page] = page_bytes(key, rank)[:5]  # torn
                    raise WriteFailed(f"page {page}")
                self.files[rank][page] = page_bytes(key, rank)
        except WriteFailed:
            worker.confirm_write_for_keys(rank, [], [page for _, page in results])
            return None
        worker.confirm_write_for_keys(rank, [(k, p) for k, p in results], [])
        return {k: p for k, p in results}

    def save_all(self, keys: list[str]) -> list[dict[str, int]]:
        """The save task on every rank; each must succeed."""
        saved = [self.save(rank, keys) for rank in range(len(self.workers))]
        assert all(s is not None for s in saved), saved
        return saved

    def load(self, rank: int, keys: list[str]) -> list[int] | None:
        """One load task: None when a block is not found; else the pages,
        each read and checked to hold its key."""
        locations = self.workers[rank].get_key_locations(rank, keys)
        assert len(locations) == len(keys), locations
        if any(loc is None for loc in locations):
            return None
        for key, page in zip(keys, locations):
            got = self.files[rank].get(page)
            assert got == page_bytes(key, rank), f"rank {rank} page {page} read for {key} holds {got!r}"
        return locations

    def load_all(self, keys: list[str]) -> None:
        for rank in range(len(self.workers)):
            assert self.load(rank, keys) is not None, f"rank {rank}: blocks not found"


@pytest.fixture
def client_cls(vllm_client_module):
    cls = vllm_client_module.Hf3fsGlobalMetadataClient
    assert cls.__module__ == "engine_vllm_hf3fs_metadata_server"
    return cls


# --------------------------------------------------------------------------
# Save, load, failed write, release of stored pages.
# --------------------------------------------------------------------------


def test_saved_blocks_are_found_and_every_page_holds_its_key(client_cls, durable_server):
    conn = Connector(client_cls, durable_server.base_url)
    keys = block_hashes(16, "prompt-a")
    saved = conn.save_all(keys)
    for rank in range(WORLD):
        assert len(set(saved[rank].values())) == len(keys), "two keys share a page"
    assert conn.hits(keys) == len(keys)
    assert conn.hits(keys + block_hashes(4, "unknown")) == len(keys)
    assert conn.hits(block_hashes(4, "unknown") + keys) == 0
    conn.load_all(keys)
    assert conn.load(0, [keys[0], block_hashes(1, "unknown")[0]]) is None

    # Saved on one rank only: not complete, so not found anywhere.
    half = block_hashes(4, "prompt-b")
    assert conn.save(0, half) is not None
    assert conn.hits(half) == 0
    assert conn.load(0, half) is None

    # Saving again what is stored gets the same pages back and rewrites them.
    again = conn.save_all(keys)
    assert again == saved
    conn.load_all(keys)
    st = durable_server.stats()
    assert st["complete_keys"] == len(keys)
    assert [r["reserved"] for r in st["ranks"]] == [0] * WORLD


def test_a_failed_write_releases_every_page_of_the_task(client_cls, durable_server):
    conn = Connector(client_cls, durable_server.base_url)
    stored = block_hashes(8, "stored")
    conn.save_all(stored)
    free_before = [r["free"] for r in durable_server.stats()["ranks"]]

    fresh = block_hashes(8, "fresh")
    assert conn.save(0, fresh) is not None
    assert conn.save(1, fresh, fail_write_at=3) is None
    st = durable_server.stats()
    assert st["ranks"][1]["free"] == free_before[1], "the failed task's pages are free again"
    assert st["ranks"][1]["reserved"] == 0
    assert conn.hits(fresh) == 0
    assert conn.load(0, fresh) is None
    # Saved again, they are stored and read back whole.
    conn.save(1, fresh)
    assert conn.hits(fresh) == len(fresh)
    conn.load_all(fresh)
    conn.load_all(stored)


def test_a_failed_save_that_reused_stored_pages_releases_them_too(client_cls, durable_server):
    # The connector releases every page of a failed task, including pages of
    # blocks that were already stored: those blocks stop being found (their
    # bytes may be torn), never read back wrong.
    conn = Connector(client_cls, durable_server.base_url)
    stored = block_hashes(6, "stored")
    conn.save_all(stored)
    extended = stored + block_hashes(4, "tail")
    assert conn.save(0, extended, fail_write_at=len(stored)) is None
    assert conn.hits(stored) == 0
    assert conn.load(1, stored) is None, "a key released on rank 0 is not complete"
    conn.save_all(extended)
    assert conn.hits(extended) == len(extended)
    conn.load_all(extended)


# --------------------------------------------------------------------------
# Restart with --data-dir.
# --------------------------------------------------------------------------


def test_clients_carry_on_across_a_crash_and_stored_blocks_survive(client_cls, durable_server):
    conn = Connector(client_cls, durable_server.base_url)
    before = block_hashes(12, "before")
    saved = conn.save_all(before)
    failed = block_hashes(4, "failed")
    assert conn.save(0, failed, fail_write_at=0) is None
    port = durable_server.port

    durable_server.kill()
    durable_server.start(port)  # the clients keep their address; no initialize

    assert conn.hits(before) == len(before)
    conn.load_all(before)
    assert [conn.workers[r].get_key_locations(r, before) for r in range(WORLD)] == [
        [saved[r][k] for k in before] for r in range(WORLD)
    ]
    assert conn.hits(failed) == 0
    # New saves get pages no stored block holds: after writing them, every
    # block, old and new, still reads back its own bytes.
    after = block_hashes(12, "after")
    conn.save_all(after)
    conn.load_all(before)
    conn.load_all(after)
    st = durable_server.stats()
    assert st["durable"] is True and st["complete_keys"] == len(before) + len(after)


# --------------------------------------------------------------------------
# Retries: the client's own loop against an unavailable server.
# --------------------------------------------------------------------------


def test_the_client_retries_through_three_503s(client_cls, durable_server, gateway):
    conn = Connector(client_cls, gateway.base_url)
    keys = block_hashes(8, "retry")
    gateway.fail_next(ATTEMPTS - 1)
    saved = conn.save_all(keys)
    assert gateway.outcomes("/keys/batch_allocate") == ["503"] * (ATTEMPTS - 1) + ["forwarded 200"] * WORLD
    conn.load_all(keys)
    assert durable_server.stats()["complete_keys"] == len(keys)
    assert len(saved) == WORLD


def test_a_fourth_503_reaches_the_caller_and_nothing_is_reserved(client_cls, durable_server, gateway):
    conn = Connector(client_cls, gateway.base_url)
    gateway.fail_next(ATTEMPTS)
    with pytest.raises(RuntimeError, match="Failed to connect to metadata server"):
        conn.workers[0].allocate_pages_for_keys(0, [(k, "") for k in block_hashes(4, "lost")])
    assert gateway.outcomes("/keys/batch_allocate") == ["503"] * ATTEMPTS
    assert durable_server.stats()["ranks"][0]["reserved"] == 0
    # The next call goes through at once.
    assert conn.save(0, block_hashes(4, "next")) is not None


def test_a_deterministic_500_is_retried_three_times_then_raised(client_cls, durable_server, gateway):
    # The binary's typed 500 (a confirm of a page nobody reserved) is what
    # the client retries: four identical requests, four identical answers,
    # and nothing changes.
    conn = Connector(client_cls, gateway.base_url)
    with pytest.raises(RuntimeError, match="500"):
        conn.workers[0].confirm_write_for_keys(0, [(block_hashes(1, "never")[0], 5)], [])
    assert gateway.outcomes("/keys/confirm_write") == ["forwarded 500"] * ATTEMPTS
    st = durable_server.stats()
    assert st["keys"] == 0 and st["ranks"][0]["free"] == NUM_PAGES
    assert durable_server.server.log().count("the page is not allocated") == ATTEMPTS


def test_the_retry_loop_rides_out_a_crash_and_restart(client_cls, durable_server, gateway):
    # The server is killed; the client's lookup meets three 503s from the
    # gateway, and its last retry is held until the restarted server answers.
    conn = Connector(client_cls, gateway.base_url)
    keys = block_hashes(10, "restart")
    saved = conn.save_all(keys)
    durable_server.kill()
    gateway.fail_next(ATTEMPTS - 1)
    gateway.hold_next()

    got: dict[str, object] = {}

    def lookup() -> None:
        try:
            got["locations"] = conn.workers[1].get_key_locations(1, keys)
        except Exception as e:  # reported below, in the test's thread
            got["error"] = e

    t = threading.Thread(target=lookup)
    t.start()
    gateway.wait_held()
    durable_server.start()  # a new port: the gateway keeps the address
    gateway.release(durable_server.port)
    t.join(JOIN_DEADLINE_S)
    assert not t.is_alive(), "the lookup did not return"
    assert "error" not in got, got
    assert got["locations"] == [saved[1][k] for k in keys]
    assert gateway.outcomes("/keys/get_locations") == ["503"] * (ATTEMPTS - 1) + ["forwarded 200"]
    conn.load_all(keys)
    conn.save_all(block_hashes(4, "after-restart"))
