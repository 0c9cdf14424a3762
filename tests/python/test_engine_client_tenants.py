"""Tenants (--tenants, docs/tenants.md) driven through the engines' own
metadata clients, two deployments of each engine at once with the same
prompts, so the same keys.

vLLM 0.33.0's ``Hf3fsGlobalMetadataClient`` and SGLang 0.5.23's, read out of
their pinned wheels (engine_wheels.py). vLLM's connector always builds its
clients for ``http://localhost:18000``, so each vLLM deployment is a tenant
with a ``listen`` address of its own, the address its clients are given
here (the deployment's localhost:18000 in its network namespace). SGLang
passes its configured URL on, so its tenants are selected by the
``/t/<tenant>`` prefix of that URL.

Each deployment has its own simulated 3FS files; every page read is
checked to hold what that deployment wrote for that key, so a page handed
across tenants shows up as a wrong read. The server runs with --data-dir
and is SIGKILLed and started again: every tenant comes back as it was.
"""

from __future__ import annotations

from pathlib import Path

import requests

import server_process
from engine_wheels import PoolName
from test_engine_client_sglang import keys_of as sglang_keys
from test_engine_client_vllm import block_hashes

WORLD = 2
NUM_PAGES = 64
TIMEOUT_S = 30.0


class VllmDeployment:
    """One vLLM deployment's scheduler and workers, with its rank files."""

    def __init__(self, name: str, client_cls, base_url: str):
        self.name = name
        self.scheduler = client_cls(base_url)
        self.scheduler.initialize(0, role="scheduler")
        self.workers = [client_cls(base_url) for _ in range(WORLD)]
        for rank, w in enumerate(self.workers):
            w.initialize(rank, NUM_PAGES)
        self.files: list[dict[int, bytes]] = [{} for _ in range(WORLD)]

    def content(self, key: str, rank: int) -> bytes:
        return f"{self.name}:{key}@{rank}".encode()

    def save(self, keys: list[str]) -> None:
        for rank, w in enumerate(self.workers):
            results = w.allocate_pages_for_keys(rank, [(k, "") for k in keys])
            assert all(page >= 0 for _, page in results), results
            for key, page in results:
                self.files[rank][page] = self.content(key, rank)
            w.confirm_write_for_keys(rank, results, [])

    def hits(self, keys: list[str]) -> int:
        flags = self.scheduler.batch_key_exists(keys)
        n = 0
        while n < len(flags) and flags[n]:
            n += 1
        return n

    def load(self, keys: list[str]) -> None:
        for rank, w in enumerate(self.workers):
            pages = w.get_key_locations(rank, keys)
            assert None not in pages, f"{self.name} rank {rank}: blocks not found"
            for key, page in zip(keys, pages):
                got = self.files[rank].get(page)
                assert got == self.content(key, rank), f"{self.name} rank {rank} page {page} for {key} holds {got!r}"


class SglangDeployment:
    """One SGLang deployment's kv pool on rank 0, with its space's file."""

    def __init__(self, name: str, client_cls, base_url: str):
        self.name = name
        self.client = client_cls(base_url)
        self.client.initialize(0, NUM_PAGES, PoolName.KV)
        self.file: dict[int, bytes] = {}

    def content(self, key: str) -> bytes:
        return f"{self.name}:{key}".encode()

    def set(self, keys: list[str]) -> None:
        indices = self.client.reserve_and_allocate_page_indices(0, [(k, "") for k in keys], PoolName.KV)
        ok = []
        for key, (written, page) in zip(keys, indices):
            assert not written and page >= 0, indices
            self.file[page] = self.content(key)
            ok.append((key, page))
        self.client.confirm_write(0, ok, [], PoolName.KV)

    def get(self, keys: list[str]) -> None:
        pages = self.client.get_page_indices(0, keys, PoolName.KV)
        assert None not in pages, pages
        for key, page in zip(keys, pages):
            got = self.file.get(page)
            assert got == self.content(key), f"{self.name} page {page} for {key} holds {got!r}"

    def exists(self, keys: list[str]) -> list[bool]:
        return self.client.exists(0, keys, PoolName.KV)


def same_prompt_in_two(va: VllmDeployment, vb: VllmDeployment) -> list[str]:
    """a saves 10 blocks of a prompt, b all 16 of the same prompt (the same
    keys): each hits only its own, and every page read holds its own bytes.
    The prompt's keys."""
    prompt = block_hashes(16, "the same system prompt")
    va.save(prompt[:10])
    # b has seen none of a's blocks: no hit, though the keys are the same.
    assert vb.hits(prompt) == 0
    vb.save(prompt)
    assert va.hits(prompt) == 10 and vb.hits(prompt) == 16
    va.load(prompt[:10])
    vb.load(prompt)
    return prompt


def tenants_file(path: Path, ports: dict[str, int]) -> Path:
    path.write_text(
        "".join(f'[tenants.{name}]\nlisten = "127.0.0.1:{port}"\n' for name, port in ports.items())
        + "[tenants.sgl-a]\n[tenants.sgl-b]\nstrict_layout = true\n"
    )
    return path


def engine_classes(vllm_client_module, sglang_client_module) -> tuple[type, type]:
    """vLLM's and SGLang's ``Hf3fsGlobalMetadataClient``, checked to be the
    wheels' own."""
    vllm_cls = vllm_client_module.Hf3fsGlobalMetadataClient
    sglang_cls = sglang_client_module.Hf3fsGlobalMetadataClient
    assert vllm_cls.__module__ == "engine_vllm_hf3fs_metadata_server"
    assert sglang_cls.__module__ == "engine_sglang_mini_3fs_metadata_server"
    return vllm_cls, sglang_cls


def test_two_vllm_and_two_sglang_deployments_with_the_same_prompts_never_share_a_page(
    tmp_path, vllm_client_module, sglang_client_module
):
    vllm_cls, sglang_cls = engine_classes(vllm_client_module, sglang_client_module)
    ports = {"vllm-a": server_process.free_loopback_port(), "vllm-b": server_process.free_loopback_port()}
    tfile = tenants_file(tmp_path / "tenants.toml", ports)
    args = ["--tenants", str(tfile), "--data-dir", str(tmp_path / "data"),
            "--evict-high-watermark", "1", "--evict-low-watermark", "1"]
    log = tmp_path / "hf3fs-meta.log"
    srv = server_process.start(log, args)
    port = srv.port
    try:
        va = VllmDeployment("vllm-a", vllm_cls, f"http://127.0.0.1:{ports['vllm-a']}")
        vb = VllmDeployment("vllm-b", vllm_cls, f"http://127.0.0.1:{ports['vllm-b']}")
        sa = SglangDeployment("sgl-a", sglang_cls, f"{srv.base_url}/t/sgl-a")
        sb = SglangDeployment("sgl-b", sglang_cls, f"{srv.base_url}/t/sgl-b")

        prompt = same_prompt_in_two(va, vb)

        skeys = sglang_keys(12, "the same prompt")
        sa.set(skeys[:4])
        assert sb.exists(skeys[:4]) == [False] * 4
        sb.set(skeys)
        sa.get(skeys[:4])
        sb.get(skeys)

        # The root routes are the tenant `default`: none of it is there.
        r = requests.post(srv.base_url + "/keys/batch_exists", json={"keys": prompt[:1]}, timeout=TIMEOUT_S)
        assert r.json() == {"exists": [False]}
        # The connection's tenant wins over the path: vllm-a's address
        # refuses vllm-b's prefix, and nothing changes.
        r = requests.post(f"http://127.0.0.1:{ports['vllm-a']}/t/vllm-b/keys/batch_exists",
                          json={"keys": prompt[:1]}, timeout=TIMEOUT_S)
        assert r.status_code == 403 and r.json()["error"]["code"] == "tenant_mismatch", r.text
        # sgl-b is strict: another page count for its space is a 409 (the
        # client raises), sgl-a keeps the reference servers' behaviour.
        r = requests.post(f"{srv.base_url}/t/sgl-b/0/initialize", json={"num_pages": 9, "namespace": "kv"},
                          timeout=TIMEOUT_S)
        assert r.status_code == 409 and r.json()["error"]["code"] == "layout_mismatch", r.text
        sa.client.initialize(0, NUM_PAGES + 1, PoolName.KV)

        # A crash and a restart: every tenant comes back as it was.
        srv.kill()
        srv = server_process.start(log, args, port)
        assert va.hits(prompt) == 10 and vb.hits(prompt) == 16
        va.load(prompt[:10])
        vb.load(prompt)
        sa.get(skeys[:4])
        sb.get(skeys)
        assert sa.exists(skeys) == [True] * 4 + [False] * 8

        m = requests.get(srv.base_url + "/metrics", timeout=TIMEOUT_S).text
        assert 'hf3fs_meta_tenant_keys{tenant="vllm-b"} 16' in m, m
        assert 'hf3fs_meta_tenant_keys{tenant="sgl-b"} 12' in m, m
    finally:
        srv.stop()
