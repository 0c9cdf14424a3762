"""The multi-node recipe of the README, tested as written.

vLLM's connector always talks to http://localhost:18000 (README, "Deploying
with vLLM"), so a cluster that shares one 3FS path forwards each node's
localhost:18000 to the one server. The README gives a socat command line for
that; this test takes the line from the README itself, changes only its two
ports (the listening port of the forward, and meta-host:18000 for the
server's loopback address), starts it, and runs the connector's flow through
the forward: two workers and the scheduler, each with its own keep-alive
session, as vLLM's processes would.

socat must be installed (`.ci/run` installs it with apt-get). A missing socat
fails this test: a green run must mean the recipe was tested.
"""

from __future__ import annotations

import shlex
import shutil
import socket
import subprocess
import time

import pytest

from test_vllm_client import (  # noqa: F401  (server is a fixture)
    REPO,
    WORLD,
    MetadataClient,
    _die_with_parent,
    allocate,
    block_hashes,
    free_loopback_port,
    leading_true,
    rank_entry,
    rank_stats,
    save,
    server,
    set_up_world,
)

README_PREFIX = "socat TCP-LISTEN:18000,"
LISTEN = "TCP-LISTEN:18000,"
TARGET = "TCP:meta-host:18000"
START_DEADLINE_S = 10.0


def documented_socat_line() -> str:
    lines = [l.strip() for l in (REPO / "README.md").read_text().splitlines() if l.strip().startswith(README_PREFIX)]
    assert len(lines) == 1, f"README.md should hold one line starting {README_PREFIX!r}, found {lines}"
    return lines[0]


def socat_argv(line: str, listen_port: int, server_port: int) -> list[str]:
    argv = shlex.split(line)
    listen = [i for i, a in enumerate(argv) if a.startswith(LISTEN)]
    target = [i for i, a in enumerate(argv) if a == TARGET]
    assert len(listen) == 1 and len(target) == 1, f"unexpected recipe {line!r}"
    argv[listen[0]] = f"TCP-LISTEN:{listen_port}," + argv[listen[0]][len(LISTEN):]
    argv[target[0]] = f"TCP:127.0.0.1:{server_port}"
    assert "bind=127.0.0.1" in argv[listen[0]], "the forward must listen on loopback only"
    return argv


def wait_listening(proc: subprocess.Popen, port: int) -> bool:
    """True once something accepts on 127.0.0.1:port; False if socat exited."""
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            pass
        try:
            # Doubles as the pause between polls: returns at once if it exits.
            proc.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            pass
    proc.kill()
    proc.wait()
    pytest.fail(f"socat did not listen on 127.0.0.1:{port} within {START_DEADLINE_S} s")


@pytest.fixture
def forward(server):
    """The README's socat line, forwarding a free loopback port to the server."""
    if shutil.which("socat") is None:
        pytest.fail(
            "socat is not installed, so the README's forwarding recipe cannot be tested. "
            "Install it (`apt-get install socat`); .ci/run does."
        )
    line = documented_socat_line()
    for _ in range(3):
        port = free_loopback_port()
        argv = socat_argv(line, port, server.port)
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent,
        )
        if wait_listening(proc, port):
            break
        # The port was taken between the probe and socat's bind: try another.
    else:
        pytest.fail(f"socat exited at start three times: {proc.stderr.read().decode(errors='replace')}")
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_readme_socat_recipe_carries_the_connector_flow(server, forward):
    scheduler = MetadataClient(forward)
    workers = [MetadataClient(forward) for _ in range(WORLD)]
    direct = MetadataClient(server.base_url)
    try:
        set_up_world(scheduler)
        keys = block_hashes(32, "through-the-forward")
        pages = {rank: save(w, rank, keys) for rank, w in enumerate(workers)}
        assert leading_true(scheduler.batch_exists(keys)) == len(keys)
        for rank, w in enumerate(workers):
            assert w.get_locations(rank, keys) == pages[rank]

        # A failed write on rank 1: every page of the batch is released, the
        # stored ones included, and the scheduler stops at the first of them.
        more = block_hashes(4, "through-the-forward", start=32)
        batch = keys[-2:] + more
        got = allocate(workers[1], 1, batch)
        assert got[:2] == pages[1][-2:]
        assert workers[1].confirm_write(1, [], got) == {}
        assert leading_true(scheduler.batch_exists(keys + more)) == len(keys) - 2

        # The server behind the forward saw exactly this (read directly).
        # Released pages of keys under a read lease stay quarantined, and
        # counted as bound, until the lease passes.
        def live(rank: int) -> int:
            r = rank_entry(direct, rank)
            return r["bound"] - r["quarantined"]

        assert live(0) == len(keys)
        assert live(1) == len(keys) - 2
        assert rank_stats(direct, 1)["reserved"] == 0
    finally:
        for c in [scheduler, direct, *workers]:
            c.close()
