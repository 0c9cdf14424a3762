"""The engines' own metadata clients reach a cluster on mutual TLS through
`hf3fs-meta relay`, unchanged.

``Hf3fsGlobalMetadataClient`` is vLLM's class and SGLang's, each read out of
its pinned wheel at test time (engine_wheels.py), driven by the flows of the
engine suites (test_engine_client_ha.py's Vllm and Sglang). Three etcd
members serve only TLS and demand a client certificate (the nodes and the
relay present theirs, `--etcd-ca`, `--etcd-cert`, `--etcd-key`); the three
nodes replicate with TLS on their ports and their stream (`--tls-cert`,
`--tls-key`, `--tls-client-ca`, `https://` advertise URLs); the relay holds
its own client certificate and verifies the leader's. The clients speak
plain HTTP to the relay on loopback, as the engines speak to
localhost:18000. A client without a certificate reaches nothing, etcd
included.

The CA and the certificates are made with the openssl command line at test
time, in the test's temporary directory (never committed). Needs etcd and
openssl (`.ci/run` installs both).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import requests

from test_engine_client_ha import Sglang, Vllm, replicated
from test_ha_relay import Cluster, spawn, wait_until
from server_process import free_loopback_port


def make_certs(d: Path, names: tuple[str, ...] = ("node", "relay", "etcd")) -> None:
    """ca.pem; node.pem/key (127.0.0.1, server and client); relay.pem/key;
    etcd.pem/key (etcd's server certificate); or one pair per name of
    `names`, each with the subject CN=<name> (its identity)."""
    openssl = shutil.which("openssl")
    assert openssl, "openssl is not installed: .ci/run installs it"
    ec = [openssl, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run = lambda argv: subprocess.run(argv, check=True, capture_output=True)  # noqa: E731
    run([*ec, "-x509", "-days", "2", "-subj", "/CN=py-ca", "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem")])
    for who in names:
        run([*ec, "-subj", f"/CN={who}", "-keyout", str(d / f"{who}.key"), "-out", str(d / f"{who}.csr")])
        (d / f"{who}.ext").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
        run([openssl, "x509", "-req", "-in", str(d / f"{who}.csr"), "-CA", str(d / "ca.pem"), "-CAkey",
             str(d / "ca.key"), "-CAcreateserial", "-days", "2", "-extfile", str(d / f"{who}.ext"), "-out",
             str(d / f"{who}.pem")])


ETCD_MEMBERS = 3


class TlsCluster(Cluster):
    """test_ha_relay's cluster with mutual TLS everywhere: three etcd
    members that serve only TLS with client certificates, the nodes, the
    relay."""

    def start_etcd(self, etcd: str | None) -> str:
        """Three members serving only TLS, each demanding a client
        certificate; the certificates are made first."""
        assert etcd, "etcd is not installed: .ci/run installs Debian's etcd-server"
        tmp = self.tmp
        make_certs(tmp)
        clients = [free_loopback_port() for _ in range(ETCD_MEMBERS)]
        peers = [f"http://127.0.0.1:{free_loopback_port()}" for _ in range(ETCD_MEMBERS)]
        urls = [f"https://127.0.0.1:{p}" for p in clients]
        initial = ",".join(f"m{i}={p}" for i, p in enumerate(peers))
        for i in range(ETCD_MEMBERS):
            self.procs[f"etcd{i}"] = spawn(
                [etcd, "--name", f"m{i}", "--data-dir", str(tmp / f"etcd{i}"), "--listen-client-urls", urls[i],
                 "--advertise-client-urls", urls[i], "--listen-peer-urls", peers[i],
                 "--initial-advertise-peer-urls", peers[i], "--initial-cluster", initial,
                 "--cert-file", str(tmp / "etcd.pem"), "--key-file", str(tmp / "etcd.key"),
                 "--trusted-ca-file", str(tmp / "ca.pem"), "--client-cert-auth",
                 "--heartbeat-interval", "50", "--election-timeout", "500"],
                tmp / f"etcd{i}.log",
            )
        for u in urls:
            wait_until(f"etcd {u} is healthy over TLS", lambda u=u: self._etcd_health(u))
            # No client certificate: the handshake is refused.
            with pytest.raises(requests.exceptions.SSLError):
                requests.get(u + "/health", timeout=5, verify=str(tmp / "ca.pem"))
        return ",".join(urls)

    def _etcd_health(self, url: str) -> bool:
        t = self.tmp
        try:
            r = requests.get(url + "/health", timeout=2, verify=str(t / "ca.pem"),
                             cert=(str(t / "node.pem"), str(t / "node.key")))
            return r.json().get("health") == "true"
        except (requests.RequestException, ValueError):
            return False

    def etcd_tls(self, who: str) -> list[str]:
        t = self.tmp
        return ["--etcd-ca", str(t / "ca.pem"), "--etcd-cert", str(t / f"{who}.pem"), "--etcd-key",
                str(t / f"{who}.key")]

    def tls(self) -> list[str]:
        t = self.tmp
        return ["--tls-cert", str(t / "node.pem"), "--tls-key", str(t / "node.key"), "--tls-client-ca",
                str(t / "ca.pem"), *self.etcd_tls("node")]

    def node(self, node_id: str, mode: list[str] | None = None) -> None:
        port = self.ports.setdefault(node_id, free_loopback_port())
        self.procs[node_id] = spawn(
            [str(self.binary), "--host", "127.0.0.1", "--port", str(port), "--workers", "1", "--ha", "etcd",
             "--etcd-endpoints", self.etcd_url, "--ha-cluster", "/py", "--node-id", node_id,
             "--advertise-url", f"https://127.0.0.1:{port}", "--ha-lease-ttl", "2",
             "--ha-token-file", str(self.tmp / "token"), *self.tls(), *(mode or [])],
            self.tmp / f"{node_id}.log",
        )
        wait_until(f"{node_id} answers /health over TLS", lambda: self.ha(node_id))

    def relay(self) -> str:
        port = free_loopback_port()
        t = self.tmp
        self.procs["relay"] = spawn(
            [str(self.binary), "relay", "--listen", f"127.0.0.1:{port}", "--etcd-endpoints", self.etcd_url,
             "--ha-cluster", "/py", "--ha-lease-ttl", "2", "--tls-ca", str(t / "ca.pem"), "--tls-cert",
             str(t / "relay.pem"), "--tls-key", str(t / "relay.key"), *self.etcd_tls("relay")],
            t / "relay.log",
        )
        url = f"http://127.0.0.1:{port}"
        wait_until("the relay reaches the TLS leader", lambda: self._get(url + "/health").get("ha", {}).get("role") == "leader")
        return url

    def ha(self, node_id: str) -> dict:
        t = self.tmp
        try:
            return requests.get(f"https://127.0.0.1:{self.ports[node_id]}/health", timeout=2, verify=str(t / "ca.pem"),
                                cert=(str(t / "node.pem"), str(t / "node.key"))).json().get("ha", {})
        except (requests.RequestException, ValueError):
            return {}


def round_trip(tmp: Path, make_engine) -> None:
    c = TlsCluster(tmp)
    try:
        for n in ("a", "b", "c"):
            c.node(n, replicated(c, n))
        leader, _ = c.leader_with_standby()
        url = c.relay()
        engine = make_engine(url)
        saved = {}
        for i in range(6):
            for space in engine.spaces:
                got = engine.save(space, engine.keys(i))
                assert got, f"save {i} in {space} was not acknowledged"
                saved[(i, id(space))] = got
        for i in range(6):
            for space in engine.spaces:
                pages = engine.load(space, engine.keys(i))
                assert pages is not None and all(p is not None for p in pages), f"load {i}: {pages}"
        # Without a client certificate the leader's port gives nothing; a
        # plain request is told it speaks TLS.
        port = c.ports[leader]
        with pytest.raises(requests.exceptions.SSLError):
            requests.post(f"https://127.0.0.1:{port}/keys/batch_exists", json={"keys": ["a"]}, timeout=5,
                          verify=str(tmp / "ca.pem"))
        plain = requests.post(f"http://127.0.0.1:{port}/keys/batch_exists", json={"keys": ["a"]}, timeout=5)
        assert plain.status_code == 400 and "TLS" in plain.text, plain.text
    finally:
        c.close()


def test_vllm_client_through_a_tls_relay(tmp_path, vllm_client_module):
    round_trip(tmp_path, lambda url: Vllm(vllm_client_module.Hf3fsGlobalMetadataClient, url))


def test_sglang_client_through_a_tls_relay(tmp_path, sglang_client_module):
    round_trip(tmp_path, lambda url: Sglang(sglang_client_module.Hf3fsGlobalMetadataClient, url))


