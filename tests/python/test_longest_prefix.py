"""POST /keys/longest_prefix against the engines' own key chains.

The keys are computed with the engines' own code from the pinned wheels
(engine_wheels.py): vLLM's ``HF3FSKVConnector._generate_block_hashes`` and
SGLang's ``get_storage_hash_str`` over its compiled native hash. The
writes go through the engines' own ``Hf3fsGlobalMetadataClient`` classes,
and the reference answer is the engines' own lookup: the leading run of
vLLM's ``batch_key_exists``, and SGLang's backend's ``batch_exists`` per
TP rank. The server is asked with the token ids only and must find the
same length: with every block stored, with a middle block missing on one
rank, with a partial last block (never stored, never counted), with a
token id above 2^32 (SGLang's wide pages), a namespace seed, and SGLang's
split -k/-v layout.
"""

from __future__ import annotations

import pytest
import requests

import engine_wheels
import server_process
from engine_wheels import PoolName

BLOCK = 4  # tokens per block (vLLM's block_size, SGLang's page_size)
WORLD = 2  # TP ranks
NUM_PAGES = 64
TIMEOUT_S = 30


@pytest.fixture(scope="session")
def vllm_chain(tmp_path_factory):
    return engine_wheels.load_vllm_key_chain(tmp_path_factory.mktemp("vllm-connector"))


@pytest.fixture(scope="session")
def sglang(tmp_path_factory):
    return engine_wheels.load_sglang_hashes(tmp_path_factory.mktemp("sglang-hash"))


@pytest.fixture
def server(tmp_path):
    srv = server_process.start(tmp_path / "hf3fs-meta.log")
    yield srv
    srv.stop()


def longest(base_url: str, body: dict) -> dict:
    r = requests.post(base_url + "/keys/longest_prefix", json=body, timeout=TIMEOUT_S)
    assert r.status_code == 200, (r.status_code, r.text)
    return r.json()


def leading(flags: list[bool]) -> int:
    n = 0
    while n < len(flags) and flags[n]:
        n += 1
    return n


# --------------------------------------------------------------------------
# vLLM
# --------------------------------------------------------------------------


def vllm_save(worker, rank: int, keys: list[str]) -> None:
    """A worker's save task: allocate, (write), confirm."""
    results = worker.allocate_pages_for_keys(rank, [(k, "") for k in keys])
    assert all(page >= 0 for _, page in results), results
    worker.confirm_write_for_keys(rank, results, [])


def test_vllm_length_is_what_batch_exists_finds(vllm_client_module, vllm_chain, server):
    cls = vllm_client_module.Hf3fsGlobalMetadataClient
    scheduler = cls(server.base_url)
    scheduler.initialize(0, role="scheduler")
    workers = [cls(server.base_url) for _ in range(WORLD)]
    for rank, w in enumerate(workers):
        w.initialize(rank, NUM_PAGES)
    # Six full blocks and a partial seventh.
    tokens = [1000 + 7 * i for i in range(6 * BLOCK + 3)]
    keys = vllm_chain(tokens, BLOCK)
    assert len(keys) == 6 and all(len(k) == 32 for k in keys), keys

    def check(expected: int, ranks: list[int]) -> None:
        lead = leading(scheduler.batch_key_exists(keys))
        got = longest(server.base_url, {"token_ids": tokens, "block_size": BLOCK})
        assert got == {"length": lead, "blocks": 6, "ranks": ranks}, (got, lead)
        assert lead == expected
        # The chain as keys: the same answer.
        assert longest(server.base_url, {"keys": keys}) == got

    check(0, [0, 0])
    # Every block on rank 0; on rank 1 all but the fourth (a middle block).
    vllm_save(workers[0], 0, keys)
    vllm_save(workers[1], 1, keys[:3] + keys[4:])
    check(3, [6, 3])
    vllm_save(workers[1], 1, keys[3:4])
    check(6, [6, 6])

    # As the connector aligns a prompt: the full blocks of all but its last
    # token (get_num_new_matched_tokens: _align_to_block_size(len - 1)).
    prompt = tokens[: 6 * BLOCK]
    aligned = prompt[: vllm_chain.align(len(prompt) - 1, BLOCK)]
    assert len(aligned) == 5 * BLOCK
    lead = leading(scheduler.batch_key_exists(vllm_chain(aligned, BLOCK)))
    got = longest(server.base_url, {"token_ids": aligned, "block_size": BLOCK})
    assert got["length"] == lead == 5, got


# --------------------------------------------------------------------------
# SGLang
# --------------------------------------------------------------------------


class RadixKey:
    """What SGLang's storage hash reads of a radix key: its token ids and
    the request's namespace parts."""

    def __init__(self, token_ids: list[int], extra_key: str | None = None, cache_salt: str | None = None):
        self.token_ids, self.extra_key, self.cache_salt = token_ids, extra_key, cache_salt

    def __len__(self) -> int:
        return len(self.token_ids)


def sglang_set(client, rank: int, keys: list[str], ns=PoolName.KV) -> None:
    """The backend's set: reserve, (write), confirm the fresh pages."""
    indices = client.reserve_and_allocate_page_indices(rank, [(k, "") for k in keys], ns)
    written = [(k, page) for k, (stored, page) in zip(keys, indices) if not stored and page >= 0]
    assert len(written) == len(keys), indices
    client.confirm_write(rank, written, [], ns)


def test_sglang_length_is_what_its_backend_finds(sglang_client_module, sglang, server):
    client = sglang_client_module.Hf3fsGlobalMetadataClient(server.base_url)
    for rank in range(WORLD):
        client.initialize(rank, NUM_PAGES, PoolName.KV)
    # Five full pages, the third holding an id above 2^32 (hashed wide), and
    # a partial sixth: SGLang stores full pages only, so hash those.
    tokens = [2000 + 3 * i for i in range(5 * BLOCK + 2)]
    tokens[2 * BLOCK + 1] = 5_000_000_000
    full = tokens[: 5 * BLOCK]
    keys = sglang.get_storage_hash_str(RadixKey(full), None, page_size=BLOCK)
    assert len(keys) == 5 and all(len(k) == 64 for k in keys), keys

    def check(ranks: list[int]) -> None:
        leads = [sglang.batch_exists(client, r, keys) for r in range(WORLD)]
        body = {"dialect": "sglang", "world_size": WORLD, "token_ids": tokens, "block_size": BLOCK}
        got = longest(server.base_url, body)
        assert got == {"length": min(leads), "blocks": 5, "ranks": leads}, (got, leads)
        assert leads == ranks
        assert longest(server.base_url, {"dialect": "sglang", "world_size": WORLD, "keys": keys}) == got

    check([0, 0])
    # Rank 0 everything; rank 1 all but the third page (a middle page).
    sglang_set(client, 0, keys)
    sglang_set(client, 1, keys[:2] + keys[3:])
    check([5, 2])
    sglang_set(client, 1, keys[2:3])
    check([5, 5])


def test_sglang_namespace_seed_and_split_layout(sglang_client_module, sglang, server):
    client = sglang_client_module.Hf3fsGlobalMetadataClient(server.base_url)
    client.initialize(0, NUM_PAGES, PoolName.KV)
    tokens = [3000 + i for i in range(4 * BLOCK + 1)]
    full = tokens[: 4 * BLOCK]
    # A request with an extra_key and a cache_salt: the chain starts from
    # the namespace seed, so it differs from the plain chain.
    seeded = sglang.get_storage_hash_str(RadixKey(full, "lora-7", "tenant-a"), None, page_size=BLOCK)
    plain = sglang.get_storage_hash_str(RadixKey(full), None, page_size=BLOCK)
    assert seeded != plain and seeded[0] != plain[0]
    sglang_set(client, 0, seeded)
    body = {"dialect": "sglang", "token_ids": tokens, "block_size": BLOCK}
    assert longest(server.base_url, body)["length"] == 0
    body.update(extra_key="lora-7", cache_salt="tenant-a")
    assert longest(server.base_url, body) == {
        "length": sglang.batch_exists(client, 0, seeded),
        "blocks": 4,
        "ranks": [4],
    }

    # The MHA zero-copy layouts store each page as <key>-k and <key>-v; a
    # page whose -v half is missing ends the run (the backend's own
    # batch_exists halves the keys' run).
    client.initialize(0, NUM_PAGES, PoolName.MAMBA)
    halves = [f"{k}-{h}" for k in plain for h in "kv"]
    sglang_set(client, 0, halves[:3] + halves[4:], PoolName.MAMBA)  # page 1 lacks its -v
    lead = sglang.batch_exists(_Namespaced(client, PoolName.MAMBA), 0, plain, mha_zero_copy=True)
    assert lead == 1
    body = {"dialect": "sglang", "namespace": "mamba", "split_kv": True, "token_ids": tokens, "block_size": BLOCK}
    assert longest(server.base_url, body) == {"length": lead, "blocks": 4, "ranks": [lead]}


class _Namespaced:
    """The client as the backend's per-pool context uses it: every call in
    one namespace."""

    def __init__(self, client, ns):
        self.client, self.ns = client, ns

    def exists(self, rank, keys):
        return self.client.exists(rank, keys, self.ns)
