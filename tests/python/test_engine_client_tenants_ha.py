"""Tenants (docs/tenants.md) on a replicated cluster (docs/ha.md), through
the engines' own clients, across failovers and a restart.

vLLM 0.33.0's ``Hf3fsGlobalMetadataClient`` and SGLang 0.5.23's, read out of
their pinned wheels (engine_wheels.py). Two nodes replicate with mutual TLS
on their ports (`--data-dir`, `--ha-sync strict`, a 2 s lease, one etcd
member on loopback), each with its own tenants file naming the same three
tenants:

- ``vllm-a`` and ``vllm-b``: one vLLM deployment each (a scheduler and two
  workers), each behind its own tenant's relay (`hf3fs-meta relay --tenant`)
  that follows the leader in etcd and presents the client certificate its
  tenant lists (**by certificate**); ``vllm-a`` also has a listen address
  on each node, which a relay with `--server` at the last leader's address
  reaches at the end (**by port**);
- ``sgl``: one SGLang deployment (two ranks, a kv pool each) through a
  plain relay whose certificate no tenant lists, at the URL
  ``…/t/sgl`` (**by path**).

All three store the same prompts (each in its engine's own key chain: the
same keys in both vLLM deployments). Each deployment writes pages naming
itself, the key and the rank into its own file per rank; every page read
is recorded and checked to hold the reading deployment's own content for
the key it was read for (the audit). Before the shared prompts each
deployment stores a different number of blocks of its own, so the same
key sits at different pages in different tenants and a lookup answered
from another tenant's table reads the wrong bytes.

Then the leader is SIGKILLed (its standby serves, reads only: strict
without a standby refuses changes), the killed node is started again on
its data (it comes back as the standby and catches up, each tenant in
sync), a second prompt is stored, and the new leader is SIGKILLed in turn:
the restarted node serves every tenant as it was, every page read of
every deployment is its own, and each tenant's key count is what it
stored.

Needs etcd and openssl (`.ci/run` installs both).
"""

from __future__ import annotations

import copy
from pathlib import Path

import requests

from engine_wheels import PoolName
from server_process import free_loopback_port
from test_engine_client_ha import replicated
from test_engine_client_sglang import Pool, keys_of
from test_engine_client_tenants import NUM_PAGES, WORLD, VllmDeployment, engine_classes
from test_engine_client_tls import TlsCluster, make_certs
from test_engine_client_vllm import block_hashes
from test_ha_relay import Cluster, spawn, wait_until

TENANTS = ("vllm-a", "vllm-b", "sgl")
PROMPTS = ("the same system prompt", "a second prompt for everyone")
BLOCKS = 16
# The bytes of one page in a deployment's simulated 3FS file.
PAGE = 192
# Blocks of its own each deployment stores first: the shared prompts' keys
# then sit at different pages in each tenant.
OWN_BLOCKS = {"vllm-a": 0, "vllm-b": 3, "sgl": 6}
TIMEOUT_S = 30.0


class Audit:
    """Every page read, by every deployment: (reader, file, page, bytes)."""

    def __init__(self) -> None:
        self.reads: list[tuple[str, str, int, bytes | None]] = []

    def check(self) -> dict[str, int]:
        """Every read held its reader's own content: the reads per reader."""
        per: dict[str, int] = {}
        for reader, name, page, got in self.reads:
            assert got is not None and got.startswith(f"{reader}:".encode()), (
                f"{reader} read {got!r} at page {page} of {name}"
            )
            per[reader] = per.get(reader, 0) + 1
        return per


class PageFile:
    """One deployment's file of one rank: page i at byte i * PAGE. Reads
    (``get``, as the deployments' flows read their pages) go to the audit."""

    def __init__(self, audit: Audit, owner: str, path: Path) -> None:
        self.audit, self.owner, self.path = audit, owner, path
        path.write_bytes(b"")

    def __setitem__(self, page: int, data: bytes) -> None:
        assert len(data) <= PAGE, data
        with open(self.path, "r+b") as f:
            f.seek(page * PAGE)
            f.write(data.ljust(PAGE, b"\0"))

    def get(self, page: int, default: bytes | None = None) -> bytes | None:
        with open(self.path, "rb") as f:
            f.seek(page * PAGE)
            got = f.read(PAGE).rstrip(b"\0") or default
        self.audit.reads.append((self.owner, self.path.name, page, got))
        return got


class AuditedVllm(VllmDeployment):
    """test_engine_client_tenants' vLLM deployment, its pages in files."""

    def __init__(self, audit: Audit, files: Path, client_cls, base_url: str):
        super().__init__(files.name, client_cls, base_url)
        self.files = [PageFile(audit, self.name, files / f"rank{r}") for r in range(WORLD)]

    def through(self, client_cls, base_url: str) -> AuditedVllm:
        """The same deployment (its files), its clients at `base_url`."""
        other = copy.copy(self)
        other.scheduler = client_cls(base_url)
        other.workers = [client_cls(base_url) for _ in range(WORLD)]
        return other


class AuditedPool(Pool):
    """test_engine_client_sglang's pool, its content naming the deployment,
    its pages in a file."""

    def __init__(self, audit: Audit, deployment: str, path: Path, client, rank: int):
        super().__init__(client, rank, PoolName.KV, NUM_PAGES)
        self.deployment = deployment
        self.file = PageFile(audit, deployment, path)

    def content(self, key: str) -> bytes:
        return f"{self.deployment}:{key}@{self.rank}/{self.ns}".encode()


class SglangDeployment:
    """One SGLang deployment: an engine process (client) per rank, its kv
    pool there."""

    def __init__(self, audit: Audit, files: Path, client_cls, base_url: str):
        self.name = files.name
        self.pools = [AuditedPool(audit, self.name, files / f"rank{r}", client_cls(base_url), r)
                      for r in range(WORLD)]

    def save(self, keys: list[str]) -> None:
        for pool in self.pools:
            indices = pool.set(keys)
            assert all(not written and page >= 0 for written, page in indices), indices

    def hits(self, keys: list[str]) -> int:
        return min(pool.hits(keys) for pool in self.pools)

    def load(self, keys: list[str]) -> None:
        for pool in self.pools:
            pages = pool.get(keys)
            assert None not in pages, f"{self.name} rank {pool.rank}: {pages}"


class TenantCluster(TlsCluster):
    """test_engine_client_tls' cluster (mutual TLS on the nodes' ports and
    streams), with one plain etcd member on loopback, and relays with the
    certificates of the test's tenants."""

    def start_etcd(self, etcd: str | None) -> str:
        self.listen: dict[str, int] = {}  # vllm-a's listen port, by node
        make_certs(self.tmp, ("node", "vllm-a", "vllm-b", "engine"))
        return Cluster.start_etcd(self, etcd)

    def etcd_tls(self, who: str) -> list[str]:
        return []

    def tenants_file(self, node_id: str) -> Path:
        """The node's own tenants file: vllm-a's listen address is the node's."""
        port = self.listen.setdefault(node_id, free_loopback_port())
        path = self.tmp / f"tenants-{node_id}.toml"
        path.write_text(
            f'[tenants.vllm-a]\nidentities = ["vllm-a"]\nlisten = "127.0.0.1:{port}"\n'
            '[tenants.vllm-b]\nidentities = ["vllm-b"]\n[tenants.sgl]\n'
        )
        return path

    def start(self, node_id: str) -> None:
        self.node(node_id, [*replicated(self, node_id), "--tenants", str(self.tenants_file(node_id))])

    def tenant_relay(self, name: str, cert: str, tenant: str | None = None, server: str | None = None) -> str:
        """A relay presenting `cert`: one tenant's (`--tenant`) or not, to
        the leader in etcd or to `server`. Its URL, once it forwards."""
        port = free_loopback_port()
        t = self.tmp
        target = ["--server", server] if server else ["--etcd-endpoints", self.etcd_url, "--ha-cluster", "/py",
                                                      "--ha-lease-ttl", "2"]
        self.procs[name] = spawn(
            [str(self.binary), "relay", "--listen", f"127.0.0.1:{port}", *target, *(["--tenant", tenant] * bool(tenant)),
             "--tls-ca", str(t / "ca.pem"), "--tls-cert", str(t / f"{cert}.pem"), "--tls-key", str(t / f"{cert}.key")],
            t / f"{name}.log",
        )
        url = f"http://127.0.0.1:{port}"
        wait_until(f"{name} forwards", lambda: seen(url) is not None)
        return url

    def https(self, node_id: str, path: str) -> requests.Response:
        t = self.tmp
        return requests.get(f"https://127.0.0.1:{self.ports[node_id]}{path}", timeout=TIMEOUT_S,
                            verify=str(t / "ca.pem"), cert=(str(t / "node.pem"), str(t / "node.key")))

    def in_sync(self, leader: str) -> bool:
        tenants = self.ha(leader).get("replication", {}).get("tenants", {})
        return all(tenants.get(name, {}).get("in_sync") for name in TENANTS)


def seen(url: str) -> dict | None:
    """`GET /tenant` through `url`: the tenant the server sees, and how."""
    try:
        return requests.get(url + "/tenant", timeout=5).json()
    except (requests.RequestException, ValueError):
        return None


def test_three_deployments_keep_their_tenants_across_failovers_and_a_restart(
    tmp_path, vllm_client_module, sglang_client_module
):
    vllm_cls, sglang_cls = engine_classes(vllm_client_module, sglang_client_module)
    c = TenantCluster(tmp_path)
    audit = Audit()
    try:
        for n in ("a", "b"):
            c.start(n)
        first, second = c.leader_with_standby()
        wait_until("every tenant in sync", lambda: c.in_sync(first))

        url_a = c.tenant_relay("relay-a", "vllm-a", tenant="vllm-a")
        url_b = c.tenant_relay("relay-b", "vllm-b", tenant="vllm-b")
        url_s = c.tenant_relay("relay-sgl", "engine") + "/t/sgl"
        relays = {url_a: {"tenant": "vllm-a", "via": "certificate"},
                  url_b: {"tenant": "vllm-b", "via": "certificate"},
                  url_s: {"tenant": "sgl", "via": "path"}}

        def tenants_seen() -> None:
            for url, want in relays.items():
                assert seen(url) == want, url

        tenants_seen()
        # The relay's connection is its tenant's: another tenant's prefix is
        # refused, and the engine relay's root routes are the tenant default.
        r = requests.post(url_a + "/t/vllm-b/keys/batch_exists", json={"keys": ["k"]}, timeout=TIMEOUT_S)
        assert r.status_code == 403 and r.json()["error"]["code"] == "tenant_mismatch", r.text
        assert seen(url_s.removesuffix("/t/sgl")) == {"tenant": "default", "via": "default"}

        files = tmp_path / "3fs"
        deployments = {}
        for name, url in (("vllm-a", url_a), ("vllm-b", url_b), ("sgl", url_s)):
            (files / name).mkdir(parents=True)
            make = SglangDeployment if name == "sgl" else AuditedVllm
            deployments[name] = make(audit, files / name, sglang_cls if name == "sgl" else vllm_cls, url)
        va, vb = deployments["vllm-a"], deployments["vllm-b"]

        def keys(name: str, prompt: str) -> list[str]:
            return keys_of(BLOCKS, prompt) if name == "sgl" else block_hashes(BLOCKS, prompt)

        stored: dict[str, list[str]] = {}
        # The page reads the loads make: one per key stored and rank.
        expected = dict.fromkeys(TENANTS, 0)

        def store(prompt: str) -> None:
            for name, d in deployments.items():
                k = keys(name, prompt)
                # Nobody else's blocks are hits, though vllm-b's keys are vllm-a's.
                assert d.hits(k) == 0, name
                d.save(k)
                stored.setdefault(name, []).extend(k)

        def load_all() -> None:
            for name, d in deployments.items():
                assert d.hits(stored[name]) == len(stored[name]), name
                d.load(stored[name])
                expected[name] += WORLD * len(stored[name])

        for name, d in deployments.items():
            own = keys(name, f"{name}'s own prompt")[: OWN_BLOCKS[name]]
            if own:
                d.save(own)
            stored[name] = own
        store(PROMPTS[0])
        load_all()
        # The same key is at another page in vllm-b than in vllm-a: a lookup
        # answered from the other tenant would read the wrong bytes.
        shared = block_hashes(BLOCKS, PROMPTS[0])
        assert va.workers[0].get_key_locations(0, shared) != vb.workers[0].get_key_locations(0, shared)

        # A failover: the leader is SIGKILLed, its standby serves every
        # tenant (reads: strict without a standby refuses changes).
        c.procs[first].kill()
        c.procs[first].wait()
        wait_until("the standby serves", lambda: c.ha(second).get("serving"))
        tenants_seen()
        load_all()

        # A restart: the killed node comes back on its data as the standby,
        # each tenant's streams in sync again; then a second prompt.
        c.start(first)
        wait_until(f"{second} names {first} its standby", lambda: c.ha(second).get("standby") == first)
        wait_until("every tenant in sync again", lambda: c.in_sync(second))
        store(PROMPTS[1])
        load_all()

        # A second failover: the restarted node serves every tenant.
        c.procs[second].kill()
        c.procs[second].wait()
        wait_until("the restarted node serves", lambda: c.ha(first).get("serving"))
        tenants_seen()
        load_all()
        # vllm-a by port: a relay at the leader's vllm-a listen address,
        # presenting a certificate no tenant lists.
        url_p = c.tenant_relay("relay-port", "engine", tenant="vllm-a",
                               server=f"https://127.0.0.1:{c.listen[first]}")
        assert seen(url_p) == {"tenant": "vllm-a", "via": "listen"}
        va.through(vllm_cls, url_p).load(stored["vllm-a"])
        expected["vllm-a"] += WORLD * len(stored["vllm-a"])

        m = c.https(first, "/metrics").text
        for name in TENANTS:
            # vLLM's keys once (a key spans the ranks), SGLang's per space.
            n = len(stored[name]) * (WORLD if name == "sgl" else 1)
            assert f'hf3fs_meta_tenant_keys{{tenant="{name}"}} {n}' in m, (name, n)
    finally:
        c.close()
    # Every page of every load was read, and each held its reader's own.
    per = audit.check()
    assert per == expected, per
    for n in ("a", "b"):
        log = (tmp_path / f"{n}.log").read_text()
        assert "panicked" not in log, log[-2000:]
    print(f"pages read, each its reader's own: {per}")
