"""Two unchanged vLLM deployments on one server, each through its own
tenant's relay (`hf3fs-meta relay --tenant NAME`, docs/tenants.md).

vLLM 0.33.0's ``Hf3fsGlobalMetadataClient``, read out of its pinned wheel
(engine_wheels.py), always talks to http://localhost:18000: here that is
each deployment's relay, on loopback as in its pod. The server runs mutual
TLS (`--tls-client-ca`): the relay of ``vllm-a`` presents a certificate no
tenant lists and forwards to ``vllm-a``'s own listen address; the relay of
``vllm-b`` presents the certificate ``vllm-b`` lists in its identities and
forwards to the server's port. Both deployments store the same prompt (the
same keys) and every page read is checked to hold what that deployment
wrote. A relay whose connections the server would not see as its tenant
refuses to start (exit 2) and says why.

The certificates are made with openssl at test time (test_engine_client_tls).
"""

from __future__ import annotations

import subprocess

import requests

from server_process import free_loopback_port, server_binary
from test_engine_client_tenants import VllmDeployment, same_prompt_in_two
from test_engine_client_tls import make_certs
from test_ha_relay import spawn, wait_until

TIMEOUT_S = 30.0


def test_two_vllm_deployments_through_their_tenant_relays_never_share_a_page(tmp_path, vllm_client_module):
    vllm_cls = vllm_client_module.Hf3fsGlobalMetadataClient
    assert vllm_cls.__module__ == "engine_vllm_hf3fs_metadata_server"
    t = tmp_path
    make_certs(t, ("node", "relay", "vllm-b"))
    port, port_a = free_loopback_port(), free_loopback_port()
    (t / "tenants.toml").write_text(
        f'[tenants.vllm-a]\nlisten = "127.0.0.1:{port_a}"\n[tenants.vllm-b]\nidentities = ["vllm-b"]\n'
    )
    binary = str(server_binary())
    procs = {}
    try:
        procs["server"] = spawn(
            [binary, "--host", "127.0.0.1", "--port", str(port), "--workers", "2", "--tenants", str(t / "tenants.toml"),
             "--tls-cert", str(t / "node.pem"), "--tls-key", str(t / "node.key"), "--tls-client-ca", str(t / "ca.pem")],
            t / "server.log",
        )

        def healthy() -> bool:
            try:
                r = requests.get(f"https://127.0.0.1:{port_a}/health", timeout=2, verify=str(t / "ca.pem"),
                                 cert=(str(t / "node.pem"), str(t / "node.key")))
                return r.status_code == 200
            except requests.RequestException:
                return False

        wait_until("the server and vllm-a's listen address answer over TLS", healthy)

        def relay(name: str, tenant: str, server_port: int, cert: str) -> subprocess.Popen:
            listen = free_loopback_port()
            procs[name] = spawn(
                [binary, "relay", "--listen", f"127.0.0.1:{listen}", "--server", f"https://127.0.0.1:{server_port}",
                 "--tenant", tenant, "--tls-ca", str(t / "ca.pem"), "--tls-cert", str(t / f"{cert}.pem"),
                 "--tls-key", str(t / f"{cert}.key")],
                t / f"{name}.log",
            )
            procs[name].listen = listen
            return procs[name]

        ra = relay("relay-a", "vllm-a", port_a, "relay")
        rb = relay("relay-b", "vllm-b", port, "vllm-b")
        url_a, url_b = f"http://127.0.0.1:{ra.listen}", f"http://127.0.0.1:{rb.listen}"

        def sees(url: str):
            try:
                return requests.get(url + "/tenant", timeout=2).json()
            except (requests.RequestException, ValueError):
                return None

        assert wait_until("relay-a forwards", lambda: sees(url_a)) == {"tenant": "vllm-a", "via": "listen"}
        assert wait_until("relay-b forwards", lambda: sees(url_b)) == {"tenant": "vllm-b", "via": "certificate"}

        va = VllmDeployment("vllm-a", vllm_cls, url_a)
        vb = VllmDeployment("vllm-b", vllm_cls, url_b)
        same_prompt_in_two(va, vb)

        # A relay for vllm-a whose certificate no tenant lists, to the
        # server's port, would land on the tenant `default`: it refuses to
        # start, and says what to change.
        bad = relay("relay-bad", "vllm-a", port, "relay")
        assert bad.wait(timeout=TIMEOUT_S) == 2
        log = (t / "relay-bad.log").read_text()
        assert "no tenant of their own" in log and "listen address" in log, log
        # A relay for vllm-b presenting vllm-b's certificate at vllm-a's
        # address: the server refuses the mismatch, so does the relay.
        bad = relay("relay-bad2", "vllm-b", port_a, "vllm-b")
        assert bad.wait(timeout=TIMEOUT_S) == 2
        log = (t / "relay-bad2.log").read_text()
        assert "403: Tenant mismatch" in log, log
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
    assert "panicked" not in (t / "server.log").read_text()
